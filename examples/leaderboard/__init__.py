"""S-Store's voting benchmark; the app is ``examples.leaderboard.app:app``."""
