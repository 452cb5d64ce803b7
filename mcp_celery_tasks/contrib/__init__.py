"""Optional integrations with other frameworks, each imported only by the projects that use it:
``django`` (the task rows in Django's admin)."""
