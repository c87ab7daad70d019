data "oci_identity_availability_domains" "all" {
  compartment_id = var.tenancy_ocid
}

resource "oci_core_instance" "box" {
  count               = var.instance_count
  compartment_id      = var.compartment_ocid
  availability_domain = data.oci_identity_availability_domains.all.availability_domains[var.availability_domain_number - 1].name
  shape               = local.shape
  display_name        = "llm-appliance-${count.index + 1}"

  source_details {
    source_type = "image"
    source_id   = oci_core_image.appliance.id
    # OCI's smallest boot volume; the image grows its root filesystem to fill it at first boot.
    boot_volume_size_in_gbs = 50
  }

  create_vnic_details {
    subnet_id        = oci_core_subnet.boxes.id
    assign_public_ip = true
    hostname_label   = "box${count.index + 1}"
  }

  # Both reach the box through the instance metadata service: the SSH key is installed for
  # root at boot, the API keys become the server's key file (one key a line).
  metadata = {
    ssh_authorized_keys = file(pathexpand(var.ssh_public_key_file))
    llm_api_keys        = join("\n", var.api_keys)
  }

  # The firmware and the shape must be set on the image before an instance boots from it.
  depends_on = [
    oci_core_compute_image_capability_schema.uefi,
    oci_core_shape_management.micro,
  ]
}
