//! Run-time support shared by the back ends: the memory planner (value lifetimes over the
//! kernel order become offsets in one arena), buffers, and profiling records.
