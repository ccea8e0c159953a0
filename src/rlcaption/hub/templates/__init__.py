"""Model-card templates (Jinja) shipped with the package; rendered by `rlcaption.hub`."""
