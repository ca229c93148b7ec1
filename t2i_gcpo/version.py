"""The package's version, in a module of its own so that any layer can read it without importing the
package root (which would be an upward import from rewards/, eval/ or commands/)."""

__version__ = "0.1.0"
