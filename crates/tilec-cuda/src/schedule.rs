//! GPU schedules.
