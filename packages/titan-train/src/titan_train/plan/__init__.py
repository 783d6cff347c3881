"""The planner (`titan-train plan`): the fastest layout of a recipe on N GPUs, found by dry-running the layouts
that can fit. Candidates (plan_space.py), their memory bound and time estimate (plan_bounds.py), the search
(planner.py), a deep model's layouts dry-run shallow and extrapolated per block (shallow_depth.py), the table,
plan.json and plan_best.toml (plan_report.py). It drives the dry run (titan_train.simulate); the dry run never
imports it.
"""
