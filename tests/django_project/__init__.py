"""A Django project of nothing but a database, for enqueue on Django's connection."""
