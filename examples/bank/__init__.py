"""TSpoon's bank transfers; the app is ``examples.bank.app:app``."""
