//! The HTTP layer: the API's route table and handlers ([`api`]), the web [`dashboard`], the
//! OpenAPI document ([`openapi`]), the OpenLambda listener's glue ([`openlambda`]) and the one
//! mapping of errors to statuses ([`error`]). Nothing below this layer imports it.

pub mod api;
pub mod dashboard;
pub mod error;
pub mod openapi;
pub mod openlambda;
pub mod reports;
