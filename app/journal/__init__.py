"""The write model, below the features: the checkpoint writer and what it writes
(message rendering, the tool life cycle, the events a checkpoint appends and how a
cursor reads them back), the session row under its lock, and turn admission. Every
feature that changes a session goes through here; nothing here knows HTTP."""
