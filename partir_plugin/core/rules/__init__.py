"""The kernel's TMR rules, one provider per concept, consulted in `PROVIDERS`' order.

A provider takes an op and the entries the providers before it found (None: none knows the op
yet) and returns the op's entries so far. The order is the order of the entries an op gets
(propagation tries them in it):

1. `partir_ops`: ops the kernel creates or lowers in its own way (their rules replace
   Shardy's);
2. `shardy`: Shardy's op sharding rules, for every op the first left unanswered;
3. `halo`: a windowed op's spatial tilings with halos, which Shardy's rules lack;
4. `prefix_scan`: a reduce_window that scans a whole dimension, tiled as a scan;
5. `embedding`: an embedding lookup's vocabulary entry;
6. `masked_window`: a dynamic_slice's masked read of a dimension it takes partly (its
   dynamic_update_slice entries are `partir_ops`').

Plugins' rules (`partir_add_tmr_rules`, by op name) answer before all of them.
"""

from __future__ import annotations

from . import embedding, halo, masked_window, partir_ops, prefix_scan, shardy

PROVIDERS = (partir_ops.provide, shardy.provide, halo.provide, prefix_scan.provide,
             embedding.provide, masked_window.provide)
