"""Checks that run partitioned code against the unpartitioned program: `tmr` verifies a tile
mapping rule's entries on tiles."""
