"""Measuring: timing and the benchmark runner, planners, bootstrap intervals, memory accounting,
acceptance metrics (`metrics`) and the benchmark report (`report`)."""
