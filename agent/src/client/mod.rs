//! The operator's side of the bus: [`ask`] sends one request to a device and waits for its
//! reply (matching the Correlation Data, so a reflected reply is ignored); [`fleet`] gathers
//! every device's status and telemetry, and [`fleet_view`] draws them as a table.

pub mod ask;
pub mod fleet;
pub mod fleet_view;
