//! Graph passes.
