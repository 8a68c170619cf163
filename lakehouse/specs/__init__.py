"""Pipeline specs: another topic's events and their aggregation, declared in YAML."""
