"""Policy: settings, locks, rules and preferences merged from defaults, a YAML file, the environment and code."""
