"""TStream's streaming ledger; the app is ``examples.ledger.app:app``."""
