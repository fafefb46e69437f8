"""How a run is configured: the command-line gin flags every command shares (`gin_flags`) and
the gin registrations of outside names (`configurables`)."""
