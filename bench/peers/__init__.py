"""Designs postroom is measured against that run outside postroom's own venv."""
