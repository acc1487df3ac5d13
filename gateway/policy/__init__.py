"""Policy as code: admin-managed YAML turned into frozen models and caller decisions."""
