"""Versions of one small app, as a team deploys them: v1 has a poison event, v2 fixes it."""
