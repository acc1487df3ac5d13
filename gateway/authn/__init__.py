"""Authentication: turn a bearer JWT into verified claims (the joserfc boundary lives here)."""
