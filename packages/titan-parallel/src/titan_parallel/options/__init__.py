"""How titan_parallel's error messages name the parameters a caller set (option_names.py)."""
