"""postroom bounces: the intake of delivery status notifications (RFC 3464) and feedback reports
(RFC 5965) sent to the VERP return paths, published as results for the recorder."""
