import os
import sys

# Make tests/ importable (the catalogs) and keep matplotlib off any display.
sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("MPLBACKEND", "Agg")
