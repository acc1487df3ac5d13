"""`gateway demo`: a fictional retailer's policy documents, served with a local issuer."""
