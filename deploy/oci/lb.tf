# One flexible load balancer at 10 Mbps minimum and maximum: the Always-Free one.
#
# TLS is terminated here with the public certificate (one certificate, renewed in one place) and
# the balancer sees requests. It then opens TLS again to each box, because llm-server on the
# appliance serves only HTTPS (it refuses plain HTTP on its API port); the boxes' certificates
# are their own self-signed ones, so the balancer does not verify them: the hop stays inside the
# VCN, and the boxes' security list admits the API port from the balancer's subnet only. The
# health check goes over that TLS too.
#
# Every request reaches a box from the balancer's address: the boxes' per-IP rate limit
# ([server.limits] rate_per_ip_per_min) then counts all clients together, so set it to the total a
# box should take, and rely on the per-key limit per client.

resource "oci_load_balancer_load_balancer" "appliance" {
  compartment_id = var.compartment_ocid
  display_name   = "llm-appliance"
  shape          = "flexible"
  subnet_ids     = [oci_core_subnet.lb.id]
  is_private     = false

  shape_details {
    minimum_bandwidth_in_mbps = 10
    maximum_bandwidth_in_mbps = 10
  }
}

resource "oci_load_balancer_backend_set" "boxes" {
  load_balancer_id = oci_load_balancer_load_balancer.appliance.id
  name             = "boxes"
  # A completion holds one of a box's few parallel slots for seconds to minutes: send each new
  # request to the box with the fewest open ones rather than in turn.
  policy = "LEAST_CONNECTIONS"

  # Re-encrypted to the boxes; their self-signed certificates are not verified (see the top).
  ssl_configuration {
    certificate_name        = oci_load_balancer_certificate.tls.certificate_name
    verify_peer_certificate = false
    protocols               = ["TLSv1.2", "TLSv1.3"]
  }

  # /health answers 200 once the model is loaded (503 while loading), without an API key,
  # over the backend set's TLS (is_force_plain_text = false).
  health_checker {
    protocol            = "HTTP"
    is_force_plain_text = false
    port        = var.api_port
    url_path    = "/health"
    return_code = 200
    interval_ms = 10000
    retries     = 3
  }
}

resource "oci_load_balancer_backend" "box" {
  count            = var.instance_count
  load_balancer_id = oci_load_balancer_load_balancer.appliance.id
  backendset_name  = oci_load_balancer_backend_set.boxes.name
  ip_address       = oci_core_instance.box[count.index].private_ip
  port             = var.api_port
}

resource "oci_load_balancer_certificate" "tls" {
  load_balancer_id   = oci_load_balancer_load_balancer.appliance.id
  certificate_name   = "llm-appliance-${substr(sha256(file(pathexpand(var.tls_certificate_file))), 0, 12)}"
  public_certificate = file(pathexpand(var.tls_certificate_file))
  private_key        = file(pathexpand(var.tls_private_key_file))

  # A new certificate must exist before the listener lets go of the old one.
  lifecycle {
    create_before_destroy = true
  }
}

resource "oci_load_balancer_listener" "https" {
  load_balancer_id         = oci_load_balancer_load_balancer.appliance.id
  name                     = "https"
  default_backend_set_name = oci_load_balancer_backend_set.boxes.name
  port                     = 443
  protocol                 = "HTTP"

  ssl_configuration {
    certificate_name        = oci_load_balancer_certificate.tls.certificate_name
    verify_peer_certificate = false
    protocols               = ["TLSv1.2"]
  }

  # A non-streamed completion sends nothing until it is done: the 60 s HTTP default would cut
  # long ones off.
  connection_configuration {
    idle_timeout_in_seconds = 600
  }
}
