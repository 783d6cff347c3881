"""The two kinds of place checkpoints live in, behind one interface (base.py); `location.as_location` picks."""
