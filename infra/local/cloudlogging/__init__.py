"""A small fake of the Cloud Logging API v2 (``entries.write``, ``entries.list``) for the local stack."""
