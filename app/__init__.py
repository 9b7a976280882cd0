"""evermirror: a self-hostable service that speaks the Everruns session API."""
