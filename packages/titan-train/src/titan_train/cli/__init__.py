"""The command-line programs: every program's argument handling, exit codes and error reporting (titan-train, titan-
generate, titan-data, titan-train plot). Imports flow down: cli -> run, simulate, generate -> config, data.
"""
