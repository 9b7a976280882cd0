"""Operations on a running service: the drain on SIGTERM and readiness."""
