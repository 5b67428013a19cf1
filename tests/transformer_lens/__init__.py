"""The TransformerLens API against TransformerLens 3.9 on the same weights (tl_reference.py builds its
models), TransformerLens' own tests ported (upstream_tests/) and its demo notebooks run on both libraries
(upstream_demos/, run by test_tl_demos.py)."""
