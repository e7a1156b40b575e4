//! `rt` layer: see docs/ARCHITECTURE.md. (Filled by its issue.)
