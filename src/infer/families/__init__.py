"""Model families, declared once and torch-free: config parsing, chat templates, and what each family is."""
