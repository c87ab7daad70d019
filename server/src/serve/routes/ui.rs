//! `GET /`: the chat page, one static HTML file embedded in the binary (no outside resources,
//! nothing built at run time). It calls the API like any client, with the key it is given.

use axum::http::header;
use axum::response::IntoResponse;

const PAGE: &str = include_str!("../../../ui/index.html");

pub async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // The page loads nothing from elsewhere, and says so to the browser.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'",
            ),
        ],
        PAGE,
    )
}
