"""What the test modules share: callers, documents, policies, tokens and the processes the
tests start. Test modules import from here, never from one another."""
