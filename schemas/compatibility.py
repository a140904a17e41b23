"""The Schema Registry's compatibility levels, apart from the registry's client: `postroom schemas
register --compatibility` offers them without importing the client and the codec."""

COMPATIBILITY_LEVELS = ("BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE",
                        "FULL", "FULL_TRANSITIVE", "NONE")
DEFAULT_COMPATIBILITY = "BACKWARD"
