"""Version 1 of Orrery's protobuf contracts (generated; see `scripts/gen_proto.py`)."""
