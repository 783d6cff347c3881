"""Pipeline parallelism: the plan (every check, no process group), the split into stages, and the schedule."""
