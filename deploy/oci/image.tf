# The custom image, imported from the qcow2 in Object Storage as `cargo xtask oci-upload` does:
# QCOW2 in PARAVIRTUALIZED launch mode (the one OCI allows for imported images on AMD shapes),
# UEFI_64 firmware (both builders make UEFI-only disks; an import defaults to BIOS), and
# compatible with the E2.1.Micro shape (imported images are not by default).

locals {
  shape = "VM.Standard.E2.1.Micro"
}

data "oci_objectstorage_namespace" "tenancy" {
  compartment_id = var.compartment_ocid
}

resource "oci_core_image" "appliance" {
  compartment_id = var.compartment_ocid
  display_name   = trimsuffix(var.image_object, ".qcow2")
  launch_mode    = "PARAVIRTUALIZED"

  image_source_details {
    source_type       = "objectStorageTuple"
    namespace_name    = data.oci_objectstorage_namespace.tenancy.namespace
    bucket_name       = var.bucket
    object_name       = var.image_object
    source_image_type = "QCOW2"
  }

  timeouts {
    create = "120m"
  }
}

data "oci_core_compute_global_image_capability_schemas" "global" {}

resource "oci_core_compute_image_capability_schema" "uefi" {
  compartment_id = var.compartment_ocid
  image_id       = oci_core_image.appliance.id
  compute_global_image_capability_schema_version_name = data.oci_core_compute_global_image_capability_schemas.global.compute_global_image_capability_schemas[0].current_version_name
  # A map from capability name to its descriptor as JSON (the provider's schema_data is a map of
  # strings).
  schema_data = {
    "Compute.Firmware" = jsonencode({
      descriptorType = "enumstring"
      source         = "IMAGE"
      defaultValue   = "UEFI_64"
      values         = ["UEFI_64"]
    })
  }
}

resource "oci_core_shape_management" "micro" {
  compartment_id = var.compartment_ocid
  image_id       = oci_core_image.appliance.id
  shape_name     = local.shape
}
