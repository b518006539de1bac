//! AWS Bedrock Converse, signed with SigV4.

mod config;
mod converse;
mod event_stream;
mod service;
mod sign;

pub use config::{AwsCredentials, BedrockConfig};
pub use converse::{decode, decode_error, encode};
pub use service::Bedrock;
pub use sign::signed_request;
