"""Measurements run from the command line, outside the node (``python3 -m p2ptrain.tools.X``)."""
