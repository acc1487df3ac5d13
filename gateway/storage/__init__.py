"""Storage engines behind small typed interfaces."""
