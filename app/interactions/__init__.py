"""Interactions: approvals a tool waits for, listed and resolved over HTTP."""
