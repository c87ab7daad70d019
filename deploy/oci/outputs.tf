output "image_id" {
  value = oci_core_image.appliance.id
}

output "load_balancer_ip" {
  description = "The API: https://<this>/v1/..."
  value       = oci_load_balancer_load_balancer.appliance.ip_address_details[0].ip_address
}

output "box_public_ips" {
  description = "For SSH (root@<ip>) and `appliance doctor`."
  value       = oci_core_instance.box[*].public_ip
}
