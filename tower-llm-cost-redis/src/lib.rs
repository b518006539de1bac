//! A Redis-backed quota store (lands next).
