"""homegpu.remote.alerts: [alerts] applied to the hub's events: which alerts fire and clear (pure), and the user's command
run for each, without a shell, in the background.
"""
