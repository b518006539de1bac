//! AWS Bedrock Converse, signed with SigV4: the Bedrock
//! [`Dialect`](crate::Dialect) ([`BedrockConfig`]) and the [`Bedrock`]
//! service.

mod config;
mod converse;
mod dialect;
mod event_stream;
mod sign;

pub use config::{AwsCredentials, BedrockConfig};
pub use converse::{decode, decode_error, encode};
pub use dialect::Bedrock;
pub use event_stream::EventStreamWire;
pub use sign::signed_request;
