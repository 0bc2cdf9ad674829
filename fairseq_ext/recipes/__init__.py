"""The data and training recipes (bash, shipped as package data) and the Python helpers they run."""
