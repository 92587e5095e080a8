"""Archive chains as a whole: retention (pure planner) and prune (the driver that deletes)."""
