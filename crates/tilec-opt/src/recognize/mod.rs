//! Composite-op recognition: rewrites what exporters spell out in primitives into the canonical composite ops.
