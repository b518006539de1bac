//! The seal of the layer-side traits: only this crate's types implement
//! them.

pub trait Sealed {}

impl Sealed for crate::Call {}
impl Sealed for crate::AttemptLog {}
impl Sealed for crate::AttemptRecord {}
impl Sealed for crate::Metrics {}
impl Sealed for crate::Failure {}
