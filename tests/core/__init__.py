"""The hook core on every family: hook points and their algebra, the cache and what it reads out of the
residual stream, norms' hooks, tokenization and padding, and the errors bad input gets."""
