"""homegpu.remote: everything that is not a front end, in one folder per concern; the folders import
each other in one order (ARCHITECTURE.md; tests/test_import_graph.py holds it). No UI imports here."""
