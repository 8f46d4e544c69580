//! Replay reports: a terminal table, the JSON report (the serialized [`crate::ReplayReport`]), and a
//! single self-contained HTML file.
